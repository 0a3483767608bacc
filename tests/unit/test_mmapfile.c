/* Model files in memory (base/mmapfile.h): ts_mmap_release gives the whole pages of a range back
 * - a big file's huge-page copy mapped from the file again, a small file's mapping dropped -
 * so that resident memory falls by about that much while every byte still reads the same; it
 * leaves alone memory it did not map, ranges without a whole page, and files already closed. */
#include "base/mmapfile.h"
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* above the size that ts_mmap_open copies into huge pages (64 MiB) */
#define BIG   ((size_t)72 << 20)
#define SMALL ((size_t)24 << 20)
#define SPAN  ((size_t)16 << 20)

static char tmpdir[64];

static uint8_t pattern(size_t i) { return (uint8_t)((i * 131u) ^ (i >> 12)); }

static int write_file(const char *path, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    static uint8_t buf[1 << 16];
    for (size_t o = 0; o < n; o += sizeof buf) {
        size_t k = n - o < sizeof buf ? n - o : sizeof buf;
        for (size_t i = 0; i < k; i++)
            buf[i] = pattern(o + i);
        if (fwrite(buf, 1, k, f) != k) {
            fclose(f);
            return -1;
        }
    }
    return fclose(f);
}

/* the first offset where m differs from the pattern, or n */
static size_t first_wrong(const ts_mmap *m) {
    for (size_t i = 0; i < m->size; i++)
        if (m->data[i] != pattern(i)) return i;
    return m->size;
}

/* reads a byte of every page (volatile: a read whose value is unused is still made) */
static void touch(const ts_mmap *m) {
    for (size_t i = 0; i < m->size; i += 4096)
        (void)((const volatile uint8_t *)m->data)[i];
}

/* One file, opened as ts_mmap_open chooses (huge_pages: as it does for a big file; else the
 * variable that keeps the mapping): a middle span given back lowers the resident memory by about
 * what the call returns - the span's whole 4 KiB pages, or for the copy its 2 MiB pages that the
 * span covers but for at most 64 KiB - and the bytes stay the pattern. */
static void check_release(const char *name, size_t size, bool huge_pages) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    if (write_file(path, size) != 0) {
        CHECKF(0, "%s: cannot write", path);
        return;
    }
    if (huge_pages)
        unsetenv("TESSERA_NO_HUGEPAGES");
    else
        setenv("TESSERA_NO_HUGEPAGES", "1", 1);
    ts_mmap m;
    ts_status st = ts_mmap_open(path, &m);
    CHECKF(st == TS_OK, "%s: %s", name, ts_last_error());
    if (st != TS_OK) return;
    touch(&m); /* every page resident, whichever way it was opened */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t start = 3 * page + 100; /* not on a page: the first partial page stays */
    const size_t before = ts_rss_bytes();
    const size_t given = ts_mmap_release(m.data + start, SPAN);
    const size_t after = ts_rss_bytes();
    /* whole pages: 4 KiB ones of a mapping, 2 MiB ones of the huge-page copy (which a big file
     * gets unless the kernel refuses huge pages) */
    const uintptr_t a0 = (uintptr_t)m.data + start, a1 = a0 + SPAN, huge = (uintptr_t)2 << 20;
    const size_t want = (a1 & ~(page - 1)) - ((a0 + page - 1) & ~(page - 1));
    const size_t want_huge = (a1 & ~(huge - 1)) - ((a0 + huge - 1) & ~(huge - 1));
    CHECKF(given == want ||
               (huge_pages && size == BIG && given >= want_huge && given <= want + huge),
           "%s: %zu bytes given back, want %zu", name, given, want);
    CHECKF(given && before > after && before - after >= given / 10 * 9,
           "%s: resident %zu -> %zu bytes, want a fall of about %zu", name, before, after, given);
    size_t wrong = first_wrong(&m);
    CHECKF(wrong == m.size, "%s: byte %zu differs from the file after the release", name, wrong);
    /* again, now that the pages were read back: the mapping's dropped again, the copy's pages
     * already the file's; still the same bytes */
    const size_t again = ts_mmap_release(m.data + start, SPAN);
    CHECKF(again == (given == want ? want : 0), "%s: %zu bytes given back again", name, again);
    wrong = first_wrong(&m);
    CHECKF(wrong == m.size, "%s: byte %zu differs after a second release", name, wrong);
    ts_mmap_close(&m);
    unsetenv("TESSERA_NO_HUGEPAGES");
    unlink(path);
}

/* The huge-page copy gives a 2 MiB page back once the ranges asked for leave at most 64 KiB of
 * it out (a model's small tensors between its regrouped weights), not while more is left out
 * (other weights, which would lose their huge page). A kernel that refuses the copy leaves the
 * file mapped: then every whole 4 KiB page goes back as asked. */
static void check_huge_pages(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/gaps.bin", tmpdir);
    if (write_file(path, BIG) != 0) {
        CHECKF(0, "%s: cannot write", path);
        return;
    }
    ts_mmap m;
    CHECK(ts_mmap_open(path, &m) == TS_OK);
    if (!m.data) return;
    const size_t huge = (size_t)2 << 20, kb = 1024;
    const uint8_t *h = (const uint8_t *)(((uintptr_t)m.data + 2 * huge) & ~(uintptr_t)(huge - 1));
    const size_t before = ts_rss_bytes();
    const size_t first = ts_mmap_release(h, huge / 2);
    if (first == 0) { /* the copy: half a page asked, nothing yet */
        CHECK(ts_mmap_release(h + huge / 2 + 32 * kb, huge / 2 - 32 * kb) == huge);
        CHECK(ts_rss_bytes() + huge / 10 * 9 <= before);
        /* the next page with 512 KB left out: kept, after either part */
        CHECK(ts_mmap_release(h + huge, huge / 2) == 0);
        CHECK(ts_mmap_release(h + huge + 3 * huge / 4, huge / 4) == 0);
        /* the gap filled: given back now */
        CHECK(ts_mmap_release(h + huge + huge / 2, huge / 4) == huge);
    } else {
        CHECK(first == huge / 2);
    }
    CHECK(first_wrong(&m) == m.size);
    ts_mmap_close(&m);
    unlink(path);
}

/* What is not a whole page of an open file is left alone; two files open, each its own. */
static void check_refusals(void) {
    char a_path[128], b_path[128];
    snprintf(a_path, sizeof a_path, "%s/a.bin", tmpdir);
    snprintf(b_path, sizeof b_path, "%s/b.bin", tmpdir);
    CHECK(write_file(a_path, SMALL) == 0 && write_file(b_path, SMALL) == 0);
    ts_mmap a, b;
    CHECK(ts_mmap_open(a_path, &a) == TS_OK && ts_mmap_open(b_path, &b) == TS_OK);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *heap = malloc(SPAN);
    CHECK(heap && ts_mmap_release(heap, SPAN) == 0); /* not a file's */
    free(heap);
    CHECK(ts_mmap_release(NULL, SPAN) == 0);
    CHECK(ts_mmap_release(a.data + 10, page) == 0);               /* no whole page in it */
    CHECK(ts_mmap_release(a.data + SMALL - page, 2 * page) == 0); /* past the file's end */
    /* the first file closed: the second still gives back, the first's range no longer counts */
    const uint8_t *gone = a.data;
    ts_mmap_close(&a);
    CHECK(ts_mmap_release(gone, SPAN) == 0);
    CHECK(ts_mmap_release(b.data, SPAN) == SPAN);
    CHECK(first_wrong(&b) == b.size);
    ts_mmap_close(&b);
    unlink(a_path);
    unlink(b_path);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/ts_mmap_XXXXXX", tu_env("TMPDIR", "/tmp"));
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "test_mmapfile: cannot make a temporary directory\n");
        return 1;
    }
    check_release("big.bin", BIG, true);     /* the huge-page copy */
    check_release("mapped.bin", BIG, false); /* a big file kept mapped */
    check_release("small.bin", SMALL, true); /* under the copy's size: mapped */
    check_huge_pages();
    check_refusals();
    rmdir(tmpdir);
    return tu_report("test_mmapfile");
}

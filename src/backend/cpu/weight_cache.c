/* The regrouped weights of the CPU backend (weight_cache.h): an open-addressing table keyed by
 * (source pointer, repack function), linear probing, grown to keep it at most half full. */
#include "backend/cpu/weight_cache.h"

#include "base/mmapfile.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* bytes of the source compared at each end on lookup */
enum { WC_EDGE = 16 };

typedef struct {
    const uint8_t *src; /* NULL: an empty slot */
    cpu_repack_fn repack;
    size_t bytes;
    uint8_t head[WC_EDGE], tail[WC_EDGE];
    uint8_t *copy;
} wc_entry;

/* The copies' memory: one reserved range (address space only until used) filled upward in the
 * order the copies are made - a model's first step, so the order its weights are used - and
 * committed with 2 MB pages asked for (madvise), since a decode step streams every weight once
 * and 4 KB pages cost a page walk each 4 KB. In that order, the prefetch a kernel runs past the
 * end of one weight reaches the start of the next one used, as it did in the file, where
 * mappings of their own would lie wherever the kernel put them (downward, one below the other;
 * the difference was not measured apart). A copy that the range cannot take gets a mapping of
 * its own; a replaced copy's space is not reused until the cache is freed. */
#define WC_RESERVE ((size_t)64 << 30)
#define WC_HUGE    ((size_t)2 << 20)

struct cpu_wcache {
    wc_entry *slot;
    size_t cap, used; /* cap: a power of two */
    long repacks;
    size_t held, limit;
    uint8_t *arena;     /* the reserved range, WC_RESERVE bytes; NULL: none */
    size_t top, mapped; /* bytes handed out; bytes made readable and writable */
};

static bool in_arena(const cpu_wcache *c, const uint8_t *p) {
    return c->arena && p >= c->arena && p < c->arena + WC_RESERVE;
}

static uint8_t *copy_alloc(cpu_wcache *c, size_t bytes) {
    if (!c->arena) {
        void *r =
            mmap(NULL, WC_RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r != MAP_FAILED) c->arena = r, c->top = c->mapped = 0;
    }
    const size_t at = (c->top + 63) / 64 * 64;
    if (c->arena && bytes <= WC_RESERVE - at) {
        const size_t end = (at + bytes + WC_HUGE - 1) / WC_HUGE * WC_HUGE;
        if (end > c->mapped) {
            const size_t grow = (end < WC_RESERVE ? end : WC_RESERVE) - c->mapped;
            if (mprotect(c->arena + c->mapped, grow, PROT_READ | PROT_WRITE) == 0) {
#ifdef MADV_HUGEPAGE
                (void)madvise(c->arena + c->mapped, grow, MADV_HUGEPAGE);
#endif
                c->mapped += grow;
            }
        }
        if (at + bytes <= c->mapped) {
            c->top = at + bytes;
            return c->arena + at;
        }
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

static void copy_free(cpu_wcache *c, uint8_t *p, size_t bytes) {
    if (p && !in_arena(c, p)) munmap(p, bytes);
}

cpu_wcache *cpu_wcache_new(void) {
    cpu_wcache *c = calloc(1, sizeof(cpu_wcache));
    if (c) c->limit = SIZE_MAX;
    return c;
}

void cpu_wcache_set_limit(cpu_wcache *c, size_t bytes) { c->limit = bytes; }

void cpu_wcache_free(cpu_wcache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->cap; i++)
        copy_free(c, c->slot[i].copy, c->slot[i].bytes);
    if (c->arena) munmap(c->arena, WC_RESERVE);
    free(c->slot);
    free(c);
}

long cpu_wcache_repacks(const cpu_wcache *c) { return c->repacks; }
size_t cpu_wcache_bytes(const cpu_wcache *c) { return c->held; }

static size_t wc_hash(const uint8_t *src, cpu_repack_fn repack) {
    uint64_t h = (uint64_t)(uintptr_t)src ^ ((uint64_t)(uintptr_t)repack << 17);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h;
}

static size_t edge(size_t bytes) { return bytes < WC_EDGE ? bytes : WC_EDGE; }

static bool wc_same_source(const wc_entry *e, const uint8_t *src, size_t bytes) {
    size_t n = edge(bytes);
    return e->bytes == bytes && !memcmp(e->head, src, n) && !memcmp(e->tail, src + bytes - n, n);
}

/* the slot of (src, repack), or the empty one where it would go */
static wc_entry *wc_find(const cpu_wcache *c, const uint8_t *src, cpu_repack_fn repack) {
    for (size_t i = wc_hash(src, repack) & (c->cap - 1);; i = (i + 1) & (c->cap - 1)) {
        wc_entry *e = &c->slot[i];
        if (!e->src || (e->src == src && e->repack == repack)) return e;
    }
}

static bool wc_grow(cpu_wcache *c) {
    size_t cap = c->cap ? 2 * c->cap : 64;
    wc_entry *old = c->slot;
    size_t old_cap = c->cap;
    c->slot = calloc(cap, sizeof *c->slot);
    if (!c->slot) {
        c->slot = old;
        return false;
    }
    c->cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].src) *wc_find(c, old[i].src, old[i].repack) = old[i];
    free(old);
    return true;
}

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    size_t rows, row_bytes;
    cpu_repack_fn repack;
} repack_job;

static void repack_worker(void *ctx, int ith, int nth) {
    const repack_job *j = ctx;
    size_t r0 = j->rows * (size_t)ith / (size_t)nth, r1 = j->rows * (size_t)(ith + 1) / (size_t)nth;
    if (r1 > r0)
        j->repack(j->src + r0 * j->row_bytes, j->dst + r0 * j->row_bytes, (r1 - r0) * j->row_bytes,
                  j->row_bytes);
}

void cpu_repack_run(ts_pool *pool, const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes,
                    cpu_repack_fn repack) {
    repack_job j = {src, dst, bytes / row_bytes, row_bytes, repack};
    if (pool && bytes >= ((size_t)1 << 20))
        ts_pool_run(pool, repack_worker, &j);
    else
        repack_worker(&j, 0, 1);
}

const uint8_t *cpu_wcache_get(cpu_wcache *c, ts_pool *pool, const uint8_t *src, size_t bytes,
                              size_t row_bytes, cpu_repack_fn repack) {
    if (2 * (c->used + 1) > c->cap && !wc_grow(c)) return NULL;
    wc_entry *e = wc_find(c, src, repack);
    if (e->src && wc_same_source(e, src, bytes)) return e->copy;
    /* new, or another tensor now at this address: (re)made, within the limit */
    const size_t others = c->held - (e->src ? e->bytes : 0);
    if (others > c->limit || bytes > c->limit - others) return NULL;
    uint8_t *copy = copy_alloc(c, bytes);
    if (!copy) return NULL;
    cpu_repack_run(pool, src, copy, bytes, row_bytes, repack);
    /* the kernels read the copy from now on: the source's memory goes back to the model file
     * (its pages read from there again if an embedding lookup or this cache's check wants them),
     * so that a regrouped model takes about its own size in memory, not twice it */
    ts_mmap_release(src, bytes);
    if (e->src) {
        c->held -= e->bytes;
        copy_free(c, e->copy, e->bytes);
    } else {
        c->used++;
    }
    size_t n = edge(bytes);
    e->src = src, e->repack = repack, e->bytes = bytes, e->copy = copy;
    memcpy(e->head, src, n);
    memcpy(e->tail, src + bytes - n, n);
    c->held += bytes;
    c->repacks++;
    return copy;
}

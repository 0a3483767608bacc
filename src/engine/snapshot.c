/* What a sequence uses of its state, and prefix snapshots kept at that size.
 *
 * A slot's state is allocated for the whole context, but a sequence of len tokens uses only
 * its summed-up part (the first seq_bytes: a hybrid model's conv and recurrent state) and the
 * first len rows of each per-position run (the KV caches, ts_arch.state_rows). Copies between
 * slots move only that, and a snapshot keeps only that: in pages of one pool allocated on the
 * device at creation (freeing device memory mid-run would stall it and invalidate the CUDA
 * backend's graphs), taken from a stack of free pages and given back on drop. A snapshot's
 * pages need not be adjacent; runs of adjacent ones go in one copy. */
#include "engine/engine_int.h"

#include <stdlib.h>
#include <string.h>

#define SNAP_MAX_ROWS  512         /* per-position runs: two a layer */
#define SNAP_PAGE_MIN  (16u << 10) /* pages: a 64th of a slot's state, within these */
#define SNAP_PAGE_MAX  (1u << 20)
#define SNAP_MAX_SNAPS 65536

/* The byte ranges of a slot's state that len tokens use: the summed-up part, then the first
 * len rows of each run. Returns how many (into off / bytes, SNAP_MAX_ROWS + 1 each). */
static int used_parts(const ts_engine *e, int len, size_t *off, size_t *bytes) {
    if (e->whole_state) {
        off[0] = 0, bytes[0] = e->state_bytes;
        return 1;
    }
    int n = 0;
    if (e->seq_bytes) off[n] = 0, bytes[n++] = e->seq_bytes;
    for (int i = 0; i < e->n_rows; i++)
        off[n] = e->rows[i].off, bytes[n++] = (size_t)len * e->rows[i].row_bytes;
    return n;
}

static size_t used_bytes(const ts_engine *e, int len) {
    size_t off[SNAP_MAX_ROWS + 1], bytes[SNAP_MAX_ROWS + 1], total = 0;
    int n = used_parts(e, len, off, bytes);
    for (int i = 0; i < n; i++)
        total += bytes[i];
    return total;
}

void engine_copy_used(ts_engine *e, void *dst, const void *src, int len) {
    size_t off[SNAP_MAX_ROWS + 1], bytes[SNAP_MAX_ROWS + 1];
    int n = used_parts(e, len, off, bytes);
    for (int i = 0; i < n; i++)
        if (bytes[i])
            e->be->ops->copy(e->be, (char *)dst + off[i], (const char *)src + off[i], bytes[i]);
}

ts_status engine_snap_init(ts_engine *e, size_t pool_bytes, int n_snaps) {
    /* the layout: trusted only where it adds up to the whole state */
    e->whole_state = true;
    if (e->model->arch->state_rows && e->state_bytes) {
        e->rows = calloc(SNAP_MAX_ROWS, sizeof *e->rows);
        if (!e->rows) return ts_error(TS_ERR_NOMEM, "out of memory");
        e->n_rows = e->model->arch->state_rows(e->model, e->n_ctx, e->rows, SNAP_MAX_ROWS);
        size_t sum = e->seq_bytes;
        for (int i = 0; i < e->n_rows; i++)
            sum += (size_t)e->n_ctx * e->rows[i].row_bytes;
        e->whole_state = e->n_rows <= 0 || sum != e->state_bytes;
    }
    if (pool_bytes == 0 || n_snaps <= 0 || e->state_bytes == 0) return TS_OK;
    if (n_snaps > SNAP_MAX_SNAPS)
        return ts_error(TS_ERR_INVALID, "%d snapshots: at most %d", n_snaps, SNAP_MAX_SNAPS);
    size_t page = SNAP_PAGE_MAX;
    while (page > SNAP_PAGE_MIN && page > e->state_bytes / 64)
        page >>= 1;
    size_t n_pages = pool_bytes / page;
    if (n_pages == 0) return TS_OK;
    if (n_pages > (size_t)1 << 30)
        return ts_error(TS_ERR_INVALID, "a snapshot pool of %zu MiB is too large",
                        pool_bytes >> 20);
    e->page_bytes = page;
    e->n_pages = (int)n_pages;
    e->free_pages = malloc(n_pages * sizeof *e->free_pages);
    e->snaps = calloc((size_t)n_snaps, sizeof *e->snaps);
    if (!e->free_pages || !e->snaps) return ts_error(TS_ERR_NOMEM, "out of memory");
    e->n_snaps = n_snaps;
    for (int i = 0; i < n_snaps; i++)
        e->snaps[i].len = -1;
    for (int i = 0; i < e->n_pages; i++) /* popped from the top: in ascending order at first */
        e->free_pages[i] = e->n_pages - 1 - i;
    e->n_free = e->n_pages;
    e->snap_pool = e->be->ops->alloc(e->be, n_pages * page);
    if (!e->snap_pool)
        return ts_error(TS_ERR_NOMEM, "out of memory for a snapshot pool of %zu MiB (--cache-mb)",
                        (n_pages * page) >> 20);
    return TS_OK;
}

void engine_snap_free(ts_engine *e) {
    for (int i = 0; e->snaps && i < e->n_snaps; i++)
        free(e->snaps[i].pages);
    free(e->snaps);
    free(e->free_pages);
    free(e->rows);
    if (e->snap_pool) e->be->ops->free(e->be, e->snap_pool);
}

static size_t pages_for(const ts_engine *e, int len) {
    return (used_bytes(e, len) + e->page_bytes - 1) / e->page_bytes;
}

size_t ts_engine_snap_bytes(const ts_engine *e, int len) {
    return e->n_pages && len >= 0 ? pages_for(e, len) * e->page_bytes : 0;
}

size_t ts_engine_snap_pool_bytes(const ts_engine *e) { return (size_t)e->n_pages * e->page_bytes; }

static ts_status check_snap(const ts_engine *e, int snap) {
    if (snap < 0 || snap >= e->n_snaps)
        return ts_error(TS_ERR_INVALID, "snapshot %d out of range 0..%d", snap, e->n_snaps - 1);
    return TS_OK;
}

void ts_engine_snap_drop(ts_engine *e, int snap) {
    if (check_snap(e, snap) != TS_OK) return;
    struct engine_snap *s = &e->snaps[snap];
    for (int i = s->n_pages; i-- > 0;) /* back on the stack so they come out in order again */
        e->free_pages[e->n_free++] = s->pages[i];
    free(s->pages);
    *s = (struct engine_snap){.len = -1};
}

int ts_engine_snap_len(const ts_engine *e, int snap) {
    return check_snap(e, snap) == TS_OK ? e->snaps[snap].len : -1;
}

/* Moves what s->len tokens use between the slot's state and the snapshot's pages (save: into
 * the pages). The parts are laid end to end in the pages; each copy spans a part's bytes that
 * lie in a run of adjacent pages. */
static void transfer(ts_engine *e, const struct engine_snap *s, char *state, bool save) {
    size_t off[SNAP_MAX_ROWS + 1], bytes[SNAP_MAX_ROWS + 1], at = 0; /* at: bytes laid so far */
    int n = used_parts(e, s->len, off, bytes);
    for (int i = 0; i < n; i++) {
        size_t done = 0;
        while (done < bytes[i]) {
            size_t k = at / e->page_bytes, in = at % e->page_bytes, run = 1;
            while (k + run < (size_t)s->n_pages && s->pages[k + run] == s->pages[k] + (int)run)
                run++;
            size_t chunk = run * e->page_bytes - in;
            if (chunk > bytes[i] - done) chunk = bytes[i] - done;
            char *page = e->snap_pool + (size_t)s->pages[k] * e->page_bytes + in;
            char *slot = state + off[i] + done;
            e->be->ops->copy(e->be, save ? page : slot, save ? slot : page, chunk);
            done += chunk, at += chunk;
        }
    }
}

ts_status ts_engine_snap_save(ts_engine *e, int slot, int snap) {
    TS_TRY(check_snap(e, snap));
    if (slot < 0 || slot >= e->n_slots)
        return ts_error(TS_ERR_INVALID, "slot %d out of range 0..%d", slot, e->n_slots - 1);
    ts_engine_snap_drop(e, snap);
    int len = e->slot_len[slot];
    size_t need = pages_for(e, len);
    if (need > (size_t)e->n_free)
        return ts_error(TS_ERR_NOMEM,
                        "a snapshot of %d tokens needs %zu KiB, the pool has %zu "
                        "KiB free",
                        len, (need * e->page_bytes) >> 10,
                        ((size_t)e->n_free * e->page_bytes) >> 10);
    struct engine_snap *s = &e->snaps[snap];
    s->pages = malloc((need ? need : 1) * sizeof *s->pages);
    if (!s->pages) return ts_error(TS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < need; i++)
        s->pages[i] = e->free_pages[--e->n_free];
    s->n_pages = (int)need;
    s->len = len;
    engine_ahead_drop(e);
    transfer(e, s, e->slot_state[slot], true);
    return TS_OK;
}

ts_status ts_engine_snap_restore(ts_engine *e, int snap, int slot) {
    TS_TRY(check_snap(e, snap));
    if (slot < 0 || slot >= e->n_slots)
        return ts_error(TS_ERR_INVALID, "slot %d out of range 0..%d", slot, e->n_slots - 1);
    const struct engine_snap *s = &e->snaps[snap];
    if (s->len < 0) return ts_error(TS_ERR_INVALID, "snapshot %d is empty", snap);
    engine_ahead_drop(e);
    transfer(e, s, e->slot_state[slot], false);
    e->slot_len[slot] = s->len;
    e->mark_len[slot] = -1;
    return TS_OK;
}

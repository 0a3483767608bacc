#include "serve/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

ts_status serve_prefix_cache_init(serve_prefix_cache *c, int n, size_t budget, int n_logits,
                                  int max_rows, serve_snapshot_drop_fn drop, void *drop_ctx) {
    memset(c, 0, sizeof *c);
    c->n_logits = n_logits > 0 ? n_logits : 0;
    c->max_rows = max_rows > 0 ? max_rows : 0;
    c->budget = budget;
    c->drop = drop;
    c->drop_ctx = drop_ctx;
    if (n <= 0 || budget == 0) return TS_OK;
    c->e = calloc((size_t)n, sizeof *c->e);
    if (!c->e) return ts_error(TS_ERR_NOMEM, "out of memory for the prefix cache");
    c->n = n;
    for (int i = 0; i < n; i++)
        c->e[i].id = i;
    return TS_OK;
}

void serve_prefix_cache_free(serve_prefix_cache *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].tokens);
        free(c->e[i].logits);
    }
    free(c->e);
    memset(c, 0, sizeof *c);
}

/* The longest usable prefix snapshot: len <= max_len, and a snapshot of exactly full_len
 * tokens only when it has logits (full_len < 0: no such rule). */
static const serve_snapshot *find(serve_prefix_cache *c, uint64_t tag, const int32_t *ids, int n,
                                  int max_len, int full_len) {
    serve_snapshot *best = NULL;
    for (int i = 0; i < c->n; i++) {
        serve_snapshot *s = &c->e[i];
        if (!s->tokens || s->tag != tag || s->len > max_len || s->len > n ||
            (best && s->len <= best->len))
            continue;
        if (s->len == full_len && !s->logits) continue;
        if (memcmp(s->tokens, ids, (size_t)s->len * sizeof *ids) == 0) best = s;
    }
    if (best) {
        best->used = ++c->clock;
        c->hits++;
    } else {
        c->misses++;
    }
    return best;
}

const serve_snapshot *serve_prefix_cache_find(serve_prefix_cache *c, uint64_t tag,
                                              const int32_t *ids, int n, int max_len) {
    return find(c, tag, ids, n, max_len, -1);
}

const serve_snapshot *serve_prefix_cache_find_prompt(serve_prefix_cache *c, uint64_t tag,
                                                     const int32_t *ids, int n) {
    return find(c, tag, ids, n, n, n);
}

static void forget_row(serve_prefix_cache *c, serve_snapshot *s) {
    if (!s->logits) return;
    free(s->logits);
    s->logits = NULL;
    c->n_rows--;
}

/* Empties an entry and gives its room back. */
static void forget(serve_prefix_cache *c, serve_snapshot *s) {
    if (!s->tokens) return;
    forget_row(c, s);
    free(s->tokens);
    s->tokens = NULL;
    s->len = 0;
    c->held -= s->bytes;
    c->n_held--;
    s->bytes = 0;
    if (c->drop) c->drop(c->drop_ctx, s->id);
}

/* The least recently used entry that holds something (and, with rows, a logits row), other
 * than skip; NULL when none. */
static serve_snapshot *oldest(serve_prefix_cache *c, const serve_snapshot *skip, bool rows) {
    serve_snapshot *o = NULL;
    for (int i = 0; i < c->n; i++) {
        serve_snapshot *s = &c->e[i];
        if (s != skip && s->tokens && (!rows || s->logits) && (!o || s->used < o->used)) o = s;
    }
    return o;
}

/* Gives the entry a copy of the row, the oldest other row dropped when max_rows are kept. */
static void keep_logits(serve_prefix_cache *c, serve_snapshot *s, const float *logits) {
    if (!logits || c->n_logits == 0 || c->max_rows == 0 || s->logits) return;
    if (c->n_rows >= c->max_rows) forget_row(c, oldest(c, s, true));
    s->logits = malloc((size_t)c->n_logits * sizeof *s->logits);
    if (!s->logits) return;
    memcpy(s->logits, logits, (size_t)c->n_logits * sizeof *logits);
    c->n_rows++;
}

int serve_prefix_cache_store(serve_prefix_cache *c, uint64_t tag, const int32_t *ids, int len,
                             const float *logits, size_t bytes) {
    if (c->n == 0 || len <= 0 || bytes > c->budget) return -1;
    serve_snapshot *victim = NULL;
    for (int i = 0; i < c->n; i++) {
        serve_snapshot *s = &c->e[i];
        if (s->tokens && s->tag == tag && s->len == len &&
            memcmp(s->tokens, ids, (size_t)len * sizeof *ids) == 0) {
            s->used = ++c->clock;
            keep_logits(c, s, logits);
            return -1;
        }
        if (!victim || (victim->tokens && !s->tokens)) victim = s; /* an empty entry first */
    }
    int32_t *copy = malloc((size_t)len * sizeof *copy);
    if (!copy) return -1;
    memcpy(copy, ids, (size_t)len * sizeof *ids);
    if (victim->tokens) victim = oldest(c, NULL, false); /* none empty: the least recently used */
    forget(c, victim);
    serve_snapshot *o;
    while (c->held + bytes > c->budget && (o = oldest(c, victim, false)))
        forget(c, o); /* the oldest others go until it fits */
    victim->tokens = copy;
    victim->tag = tag;
    victim->len = len;
    victim->bytes = bytes;
    c->held += bytes;
    c->n_held++;
    victim->used = ++c->clock;
    keep_logits(c, victim, logits);
    c->stores++;
    return victim->id;
}

bool serve_prefix_cache_holds(const serve_prefix_cache *c, int id, uint64_t tag, const int32_t *ids,
                              int len) {
    if (id < 0 || id >= c->n) return false;
    const serve_snapshot *s = &c->e[id];
    return s->tokens && s->tag == tag && s->len == len &&
           memcmp(s->tokens, ids, (size_t)len * sizeof *ids) == 0;
}

void serve_prefix_cache_drop(serve_prefix_cache *c, int id) {
    if (id >= 0 && id < c->n) forget(c, &c->e[id]);
}

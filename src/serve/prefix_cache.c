#include "serve/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

ts_status serve_prefix_cache_init(serve_prefix_cache *c, int n, int first_slot, int n_logits) {
    memset(c, 0, sizeof *c);
    c->n_logits = n_logits > 0 ? n_logits : 0;
    if (n <= 0) return TS_OK;
    c->e = calloc((size_t)n, sizeof *c->e);
    if (!c->e) return ts_error(TS_ERR_NOMEM, "out of memory for the prefix cache");
    c->n = n;
    for (int i = 0; i < n; i++) c->e[i].slot = first_slot + i;
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
static const serve_snapshot *find(serve_prefix_cache *c, const int32_t *ids, int n, int max_len,
                                  int full_len) {
    serve_snapshot *best = NULL;
    for (int i = 0; i < c->n; i++) {
        serve_snapshot *s = &c->e[i];
        if (!s->tokens || s->len > max_len || s->len > n || (best && s->len <= best->len))
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

const serve_snapshot *serve_prefix_cache_find(serve_prefix_cache *c, const int32_t *ids, int n,
                                              int max_len) {
    return find(c, ids, n, max_len, -1);
}

const serve_snapshot *serve_prefix_cache_find_prompt(serve_prefix_cache *c, const int32_t *ids,
                                                     int n) {
    return find(c, ids, n, n, n);
}

/* Gives the entry a copy of the row (reusing its buffer), or none. */
static void keep_logits(serve_prefix_cache *c, serve_snapshot *s, const float *logits) {
    if (!logits || c->n_logits == 0) {
        free(s->logits);
        s->logits = NULL;
        return;
    }
    if (!s->logits) s->logits = malloc((size_t)c->n_logits * sizeof *s->logits);
    if (s->logits) memcpy(s->logits, logits, (size_t)c->n_logits * sizeof *logits);
}

int serve_prefix_cache_store(serve_prefix_cache *c, const int32_t *ids, int len,
                             const float *logits) {
    if (c->n == 0 || len <= 0) return -1;
    serve_snapshot *victim = NULL;
    for (int i = 0; i < c->n; i++) {
        serve_snapshot *s = &c->e[i];
        if (s->tokens && s->len == len && memcmp(s->tokens, ids, (size_t)len * sizeof *ids) == 0) {
            s->used = ++c->clock;
            if (logits && !s->logits) keep_logits(c, s, logits);
            return -1;
        }
        /* an empty slot first, else the least recently used */
        if (!s->tokens) {
            if (!victim || victim->tokens) victim = s;
        } else if (!victim || (victim->tokens && s->used < victim->used)) {
            victim = s;
        }
    }
    int32_t *copy = malloc((size_t)len * sizeof *copy);
    if (!copy) return -1;
    memcpy(copy, ids, (size_t)len * sizeof *ids);
    free(victim->tokens);
    victim->tokens = copy;
    victim->len = len;
    victim->used = ++c->clock;
    keep_logits(c, victim, logits);
    c->stores++;
    return victim->slot;
}

void serve_prefix_cache_drop(serve_prefix_cache *c, int slot) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].slot == slot) {
            free(c->e[i].tokens);
            free(c->e[i].logits);
            c->e[i].tokens = NULL;
            c->e[i].logits = NULL;
            c->e[i].len = 0;
        }
}

#include "serve/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

ts_status serve_prefix_cache_init(serve_prefix_cache *c, int n, int first_slot) {
    memset(c, 0, sizeof *c);
    if (n <= 0) return TS_OK;
    c->e = calloc((size_t)n, sizeof *c->e);
    if (!c->e) return ts_error(TS_ERR_NOMEM, "out of memory for the prefix cache");
    c->n = n;
    for (int i = 0; i < n; i++) c->e[i].slot = first_slot + i;
    return TS_OK;
}

void serve_prefix_cache_free(serve_prefix_cache *c) {
    for (int i = 0; i < c->n; i++) free(c->e[i].tokens);
    free(c->e);
    memset(c, 0, sizeof *c);
}

const serve_snapshot *serve_prefix_cache_find(serve_prefix_cache *c, const int32_t *ids, int n,
                                              int max_len) {
    serve_snapshot *best = NULL;
    for (int i = 0; i < c->n; i++) {
        serve_snapshot *s = &c->e[i];
        if (!s->tokens || s->len > max_len || s->len > n || (best && s->len <= best->len))
            continue;
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

int serve_prefix_cache_store(serve_prefix_cache *c, const int32_t *ids, int len) {
    if (c->n == 0 || len <= 0) return -1;
    serve_snapshot *victim = NULL;
    for (int i = 0; i < c->n; i++) {
        serve_snapshot *s = &c->e[i];
        if (s->tokens && s->len == len && memcmp(s->tokens, ids, (size_t)len * sizeof *ids) == 0) {
            s->used = ++c->clock;
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
    c->stores++;
    return victim->slot;
}

void serve_prefix_cache_drop(serve_prefix_cache *c, int slot) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].slot == slot) {
            free(c->e[i].tokens);
            c->e[i].tokens = NULL;
            c->e[i].len = 0;
        }
}

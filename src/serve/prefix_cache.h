/* Which token sequences the snapshot slots hold: a bounded LRU keyed by token sequence.
 *
 * The engine keeps each snapshot's state in its own slot (1..n); this module only decides
 * which slot holds what, finds the longest snapshot that is a prefix of a new prompt, and picks
 * the slot to overwrite when a new snapshot is taken. A snapshot taken at the end of a prompt
 * also keeps that prompt's last logits row (host memory), so the same prompt again needs no
 * prefill at all: the state is restored and the first token sampled from the stored row. It
 * never touches the engine, so it is tested on its own. */
#ifndef TS_SERVE_PREFIX_CACHE_H
#define TS_SERVE_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "tessera.h"

typedef struct {
    int32_t *tokens; /* owned; NULL = the slot is empty */
    int len;
    int slot;       /* engine slot holding the state */
    uint64_t used;  /* LRU clock of the last hit or store */
    float *logits;  /* owned [n_logits]: logits of the last token, or NULL */
} serve_snapshot;

typedef struct {
    serve_snapshot *e; /* [n] */
    int n;
    int n_logits; /* floats in a stored logits row (the vocabulary) */
    uint64_t clock;
    uint64_t hits, misses, stores;
} serve_prefix_cache;

/* n snapshot slots, engine slots first_slot .. first_slot + n - 1 (n may be 0: no cache);
 * logits rows of n_logits floats. */
ts_status serve_prefix_cache_init(serve_prefix_cache *c, int n, int first_slot, int n_logits);
void serve_prefix_cache_free(serve_prefix_cache *c);

/* The longest snapshot whose tokens are a prefix of ids[0..n) and hold at most max_len
 * tokens; NULL when none. Marks it used. */
const serve_snapshot *serve_prefix_cache_find(serve_prefix_cache *c, const int32_t *ids, int n,
                                              int max_len);

/* For a prompt ids[0..n): the longest snapshot that is a proper prefix of it, or the whole
 * prompt itself when that snapshot has its logits (the first token needs logits: a snapshot
 * of all n tokens without them is no use). NULL when none. Marks it used. */
const serve_snapshot *serve_prefix_cache_find_prompt(serve_prefix_cache *c, const int32_t *ids,
                                                     int n);

/* Reserves a slot for a snapshot of ids[0..len) and keeps a copy of logits (the last token's
 * row, or NULL): returns the engine slot to copy the state into, or -1 when there is nothing
 * to do (no cache, or that exact sequence is already held — then it is only marked used, and
 * given the logits row if it had none). The entry is recorded at once; if the copy fails the
 * caller calls serve_prefix_cache_drop. Without memory for the row the snapshot is kept
 * without it. */
int serve_prefix_cache_store(serve_prefix_cache *c, const int32_t *ids, int len,
                             const float *logits);
void serve_prefix_cache_drop(serve_prefix_cache *c, int slot);

#endif

/* Which token sequences the prefix snapshots hold: a bounded LRU keyed by token sequence,
 * within a byte budget.
 *
 * The engine keeps each snapshot's state in its pool (ts_engine_snap_*), at the size its
 * tokens take; this module decides which sequences are held, finds the longest snapshot that is
 * a prefix of a new prompt, and picks what to drop when a new one needs the room: the least
 * recently used, as many as it takes (the drop callback gives their room back to the engine).
 * A snapshot taken at the end of a prompt also keeps that prompt's last logits row (host
 * memory, at most max_rows of them: the oldest rows go first), so the same prompt again needs
 * no prefill at all: the state is restored and the first token sampled from the stored row. It
 * never touches the engine itself, so it is tested on its own.
 *
 * Each entry also has a tag: what else its state depends on than its tokens - the LoRA adapters
 * and scales it was computed with (serve_lora_tag; 0: none). A lookup finds only entries of its
 * own tag. */
#ifndef TS_SERVE_PREFIX_CACHE_H
#define TS_SERVE_PREFIX_CACHE_H

#include "tessera.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t *tokens; /* owned; NULL = the entry is empty */
    uint64_t tag;
    int len;
    int id;        /* the engine's snapshot id: the entry's index */
    size_t bytes;  /* of the budget */
    uint64_t used; /* LRU clock of the last hit or store */
    float *logits; /* owned [n_logits]: logits of the last token, or NULL */
} serve_snapshot;

/* Gives an entry's room back: called with its id whenever an entry is dropped or replaced. */
typedef void (*serve_snapshot_drop_fn)(void *ctx, int id);

typedef struct {
    serve_snapshot *e; /* [n] */
    int n;
    size_t budget, held;  /* bytes: at most, and taken by the entries */
    int n_held;           /* entries that hold a snapshot */
    int n_logits;         /* floats in a stored logits row (the vocabulary) */
    int max_rows, n_rows; /* logits rows kept: at most, and now */
    serve_snapshot_drop_fn drop;
    void *drop_ctx;
    uint64_t clock;
    uint64_t hits, misses, stores;
} serve_prefix_cache;

/* Up to n entries (ids 0..n-1; n may be 0: no cache) taking at most budget bytes, logits rows
 * of n_logits floats (at most max_rows of them); drop (may be NULL) is told of each entry
 * dropped. */
ts_status serve_prefix_cache_init(serve_prefix_cache *c, int n, size_t budget, int n_logits,
                                  int max_rows, serve_snapshot_drop_fn drop, void *drop_ctx);
void serve_prefix_cache_free(serve_prefix_cache *c);

/* The longest snapshot whose tokens are a prefix of ids[0..n) and hold at most max_len
 * tokens; NULL when none. Marks it used. */
const serve_snapshot *serve_prefix_cache_find(serve_prefix_cache *c, uint64_t tag,
                                              const int32_t *ids, int n, int max_len);

/* For a prompt ids[0..n): the longest snapshot that is a proper prefix of it, or the whole
 * prompt itself when that snapshot has its logits (the first token needs logits: a snapshot
 * of all n tokens without them is no use). NULL when none. Marks it used. */
const serve_snapshot *serve_prefix_cache_find_prompt(serve_prefix_cache *c, uint64_t tag,
                                                     const int32_t *ids, int n);

/* Reserves an entry for a snapshot of ids[0..len) that takes bytes, dropping the least recently
 * used ones until it fits, and keeps a copy of logits (the last token's row, or NULL): returns
 * the id to save the state into, or -1 when there is nothing to do (no cache, more bytes than
 * the budget, or that exact sequence is already held - then it is only marked used, and given
 * the logits row if it had none). The entry is recorded at once; if the save fails the caller
 * calls serve_prefix_cache_drop. Without memory for the row the snapshot is kept without it. */
int serve_prefix_cache_store(serve_prefix_cache *c, uint64_t tag, const int32_t *ids, int len,
                             const float *logits, size_t bytes);
void serve_prefix_cache_drop(serve_prefix_cache *c, int id);
/* Whether entry id holds exactly ids[0..len): a reservation made earlier may have been dropped
 * (another one needed the room) and the id given to another sequence before its state was
 * saved - then that state must not go in. */
bool serve_prefix_cache_holds(const serve_prefix_cache *c, int id, uint64_t tag, const int32_t *ids,
                              int len);

#endif

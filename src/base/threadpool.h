/* A persistent pool of worker threads, ggml style: one job at a time runs on every thread.
 *
 * ts_pool_run(pool, fn, ctx) calls fn(ctx, ith, nth) on all nth threads (the caller is ith 0)
 * and returns when every call has returned. Each fn splits its own work by (ith, nth). Workers
 * spin briefly between jobs (decode issues hundreds of small jobs per token) and then sleep. */
#ifndef TS_BASE_THREADPOOL_H
#define TS_BASE_THREADPOOL_H

#include "base/status.h"

typedef struct ts_pool ts_pool;
typedef void (*ts_pool_fn)(void *ctx, int ith, int nth);

ts_status ts_pool_create(int n_threads, ts_pool **out);
void ts_pool_free(ts_pool *pool);
int ts_pool_size(const ts_pool *pool);
/* Not reentrant: one thread drives a pool. fn must not call ts_pool_run on the same pool. */
void ts_pool_run(ts_pool *pool, ts_pool_fn fn, void *ctx);

/* Splits [0, n) into nth near-equal parts; part ith is [*lo, *hi). */
static inline void ts_split_range(long n, int ith, int nth, long *lo, long *hi) {
    long q = n / nth, r = n % nth;
    *lo = ith * q + (ith < r ? ith : r);
    *hi = *lo + q + (ith < r ? 1 : 0);
}

#endif

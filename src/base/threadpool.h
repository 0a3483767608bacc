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

/* Balanced jobs, for work whose cost per item is the same on every thread (a matmul's rows):
 * ts_pool_run_balanced runs fn as ts_pool_run does, over n items that fn divides with
 * ts_pool_share, and times each thread's call. The shares follow the speed the threads showed on
 * the balanced jobs so far (items per second, a moving average; equal parts at first, none
 * under half or over one and a half equal parts), so that they finish together when one core
 * runs slower than another for a while - a busy sibling thread, the host of a virtual machine:
 * with two threads and equal halves, one of them waited 12-17% of a quantized decode step's
 * matmul time, the same thread in most jobs of a run. The parts are contiguous, in thread
 * order, and cover [0, n) exactly; a pool of one thread gives it everything. */
void ts_pool_run_balanced(ts_pool *pool, ts_pool_fn fn, void *ctx, long n);
void ts_pool_share(const ts_pool *pool, long n, int ith, int nth, long *lo, long *hi);
/* Thread ith's current share (for tests and reports). */
double ts_pool_share_of(const ts_pool *pool, int ith);

/* Splits [0, n) into nth near-equal parts; part ith is [*lo, *hi). */
static inline void ts_split_range(long n, int ith, int nth, long *lo, long *hi) {
    long q = n / nth, r = n % nth;
    *lo = ith * q + (ith < r ? ith : r);
    *hi = *lo + q + (ith < r ? 1 : 0);
}

#endif

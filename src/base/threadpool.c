#include "base/threadpool.h"

#include "base/clock.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spins before a worker sleeps; about 50-100 us on current x86, enough to bridge the gaps
 * between the kernels of one forward pass. */
#define SPIN_ITERS 20000

typedef struct {
    ts_pool *pool;
    int ith;
} worker_arg;

struct ts_pool {
    int n;
    pthread_t *threads;
    worker_arg *args;
    atomic_uint gen;    /* bumped once per job */
    atomic_int pending; /* workers that have not finished the current job */
    atomic_int stop;
    ts_pool_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* balanced jobs: each thread's share of the items, the seconds its last call of fn took
     * (written by that thread before it reports the job done), and rebalance's scratch */
    double *share, *t_fn, *next;
};

/* The moving average's weight of one job, and the shortest job that counts: below ~20 us a
 * job's time is mostly the hand-over, not the thread's speed. */
#define BALANCE_RATE  0.1
#define BALANCE_MIN_S 20e-6

static void *worker_main(void *p) {
    worker_arg *a = p;
    ts_pool *pool = a->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_acquire)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load_explicit(&pool->stop, memory_order_acquire)) break;
        seen = g;
        double t0 = ts_now_s();
        pool->fn(pool->ctx, a->ith, pool->n);
        pool->t_fn[a->ith] = ts_now_s() - t0;
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

ts_status ts_pool_create(int n_threads, ts_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return ts_error(TS_ERR_INVALID, "thread count %d out of range 1..1024", n_threads);
    ts_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return ts_error(TS_ERR_NOMEM, "thread pool: out of memory");
    pool->n = n_threads;
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->stop, 0);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->share = malloc((size_t)n_threads * sizeof *pool->share);
    pool->t_fn = calloc((size_t)n_threads, sizeof *pool->t_fn);
    pool->next = calloc((size_t)n_threads, sizeof *pool->next);
    if (!pool->share || !pool->t_fn || !pool->next) {
        ts_pool_free(pool);
        return ts_error(TS_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 0; i < n_threads; i++)
        pool->share[i] = 1.0 / n_threads;
    if (n_threads > 1) {
        pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
        pool->args = calloc((size_t)n_threads, sizeof *pool->args);
        if (!pool->threads || !pool->args) {
            ts_pool_free(pool);
            return ts_error(TS_ERR_NOMEM, "thread pool: out of memory");
        }
        for (int i = 1; i < n_threads; i++) {
            pool->args[i] = (worker_arg){pool, i};
            if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]) != 0) {
                pool->n = i; /* join only the ones that started */
                ts_pool_free(pool);
                return ts_error(TS_ERR_NOMEM, "thread pool: cannot start thread %d", i);
            }
        }
    }
    *out = pool;
    return TS_OK;
}

void ts_pool_free(ts_pool *pool) {
    if (!pool) return;
    if (pool->threads) {
        pthread_mutex_lock(&pool->mu);
        atomic_store(&pool->stop, 1);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
        for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    }
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool->args);
    free(pool->share);
    free(pool->t_fn);
    free(pool->next);
    free(pool);
}

int ts_pool_size(const ts_pool *pool) { return pool ? pool->n : 1; }

void ts_pool_run(ts_pool *pool, ts_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    double t0 = ts_now_s();
    fn(ctx, 0, pool->n);
    pool->t_fn[0] = ts_now_s() - t0;
    /* spin while the others finish; yield when it takes long, so a descheduled worker (more
     * threads than free cores) can run instead of us burning its core */
    for (long spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_ITERS)
            cpu_relax();
        else
            sched_yield();
    }
}

void ts_pool_share(const ts_pool *pool, long n, int ith, int nth, long *lo, long *hi) {
    if (!pool || nth != pool->n || nth == 1) {
        ts_split_range(n, ith, nth, lo, hi);
        return;
    }
    /* the cumulative shares before and through ith, summed in the same order by every thread,
     * so that one part's end is the next part's start */
    double before = 0.0;
    for (int i = 0; i < ith; i++)
        before += pool->share[i];
    double through = before + pool->share[ith];
    *lo = ith == 0 ? 0 : (long)(before * (double)n + 0.5);
    *hi = ith == nth - 1 ? n : (long)(through * (double)n + 0.5);
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
    if (*hi < *lo) *hi = *lo;
}

double ts_pool_share_of(const ts_pool *pool, int ith) {
    return pool && ith >= 0 && ith < pool->n ? pool->share[ith] : 0.0;
}

/* The shares moved toward each thread's speed on the job just done (items per second). */
static void rebalance(ts_pool *pool, long n) {
    int nth = pool->n;
    double total = 0.0;
    for (int i = 0; i < nth; i++) {
        long lo, hi;
        ts_pool_share(pool, n, i, nth, &lo, &hi);
        if (hi <= lo || pool->t_fn[i] < BALANCE_MIN_S) return; /* nothing to learn */
        pool->next[i] = (double)(hi - lo) / pool->t_fn[i];
        total += pool->next[i];
    }
    double sum = 0.0;
    for (int i = 0; i < nth; i++) {
        double s = (1.0 - BALANCE_RATE) * pool->share[i] + BALANCE_RATE * pool->next[i] / total;
        double lo_s = 0.5 / nth, hi_s = 1.5 / nth;
        pool->next[i] = s < lo_s ? lo_s : s > hi_s ? hi_s : s;
        sum += pool->next[i];
    }
    for (int i = 0; i < nth; i++)
        pool->share[i] = pool->next[i] / sum;
}

void ts_pool_run_balanced(ts_pool *pool, ts_pool_fn fn, void *ctx, long n) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    /* the shares change only here, between jobs: every thread divides a job's items with the
     * same values (the workers read them after the job's release) */
    ts_pool_run(pool, fn, ctx);
    rebalance(pool, n);
}

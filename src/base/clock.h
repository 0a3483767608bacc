/* Seconds on the monotonic clock: durations and deadlines that the wall clock's steps cannot
 * disturb (the pool's job timing, the bandwidth probe, the server's and the CLI's timings). */
#ifndef TS_BASE_CLOCK_H
#define TS_BASE_CLOCK_H

#include <pthread.h>
#include <time.h>

static inline double ts_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A condition variable whose timed waits take deadlines on the monotonic clock. */
static inline void ts_cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* The monotonic deadline ms milliseconds from now, for such a variable's timed wait. */
static inline void ts_deadline_in_ms(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

#endif

/* Seconds on the monotonic clock: durations and deadlines that the wall clock's steps cannot
 * disturb (the pool's job timing, the bandwidth probe, the server's and the CLI's timings). */
#ifndef TS_BASE_CLOCK_H
#define TS_BASE_CLOCK_H

#include <time.h>

static inline double ts_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif

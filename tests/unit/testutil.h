/* Minimal test harness: CHECK records a failure with file:line and goes on; main returns the
 * failure count so CTest sees it. */
#ifndef TS_TESTUTIL_H
#define TS_TESTUTIL_H

#include "base/clock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tu_failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
            tu_failures++;                                                                         \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            tu_failures++;                                                                         \
        }                                                                                          \
    } while (0)

/* A growing byte buffer for building files in tests ({0} to start; the caller frees p). */
typedef struct {
    unsigned char *p;
    size_t n, cap;
} tu_bytes;

static inline void tu_put(tu_bytes *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) exit(2);
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static inline const char *tu_env(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static inline int tu_report(const char *name) {
    if (tu_failures)
        fprintf(stderr, "%s: %d check(s) failed\n", name, tu_failures);
    else
        printf("%s: ok\n", name);
    return tu_failures ? 1 : 0;
}

/* Busy for us microseconds of wall time: a thread made slow on purpose. */
static inline void tu_spin_us(double us) {
    double until = ts_now_s() + 1e-6 * us;
    while (ts_now_s() < until) {
    }
}

/* ||a-b|| / ||b|| in double */
static inline double tu_rel_l2(const float *a, const float *b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* xorshift64* for reproducible random test data */
static inline unsigned long long tu_rng_next(unsigned long long *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}
static inline float tu_rng_uniform(unsigned long long *s) { /* [-1, 1) */
    return (float)((tu_rng_next(s) >> 40) * (1.0 / (1ULL << 24)) * 2.0 - 1.0);
}

#endif

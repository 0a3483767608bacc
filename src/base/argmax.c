/* Two passes the compiler vectorises: the largest value over 16 running maxima (v > m ? v : m
 * leaves m where v is NaN), then its first index, 16 values at a time. One pass comparing each
 * value with the best so far through a branch took 220-290 us for a 262144-token vocabulary
 * (on the main thread, while the worker waits); these take 50-100. (Built at the default -O2:
 * GCC 12 turns the 16 maxima into maxps there, not at -O3.) */
#include "base/argmax.h"

#include <math.h>

enum { L = 16 };

float ts_max_f32(const float *v, int n) {
    float m[L];
    for (int k = 0; k < L; k++) m[k] = -INFINITY;
    int j = 0;
    for (; j + L <= n; j += L)
        for (int k = 0; k < L; k++) m[k] = v[j + k] > m[k] ? v[j + k] : m[k];
    float mx = -INFINITY;
    for (int k = 0; k < L; k++) mx = m[k] > mx ? m[k] : mx;
    for (; j < n; j++) mx = v[j] > mx ? v[j] : mx;
    return mx;
}

int ts_argmax_f32(const float *v, int n) {
    float mx = ts_max_f32(v, n);
    int j;
    for (j = 0; j + L <= n; j += L) {
        int hit = 0;
        for (int k = 0; k < L; k++) hit |= v[j + k] == mx;
        if (hit) break;
    }
    for (; j < n; j++)
        if (v[j] == mx) return j;
    return 0;
}

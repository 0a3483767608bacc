/* A memory read-bandwidth probe: the roof that decode (which streams every weight once per
 * token) is measured against in `tessera bench`. */
#ifndef TS_BACKEND_CPU_BANDWIDTH_H
#define TS_BACKEND_CPU_BANDWIDTH_H

#include <stddef.h>

#include "base/threadpool.h"

/* GB/s (1e9 bytes per second) of reading a fresh buffer of `bytes` bytes (use >= 1 GiB, well
 * past the caches) with all threads of pool (NULL: one thread), each thread summing its own
 * contiguous slice with the widest SIMD loads this CPU supports. Best of reps passes (at least
 * one). Returns 0.0 when the buffer cannot be allocated. */
double cpu_measure_read_bandwidth(ts_pool *pool, size_t bytes, int reps);

#endif

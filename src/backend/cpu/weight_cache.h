/* Weights in a kernel's own layout. Some quantized kernels (the AVX-512 Q4_K, Q6_K and Q4_0
 * tiles) read their blocks regrouped so that decoding them takes no permutes (matmul_q_avx512.c);
 * the regrouped copy of a weight is made on its first use and kept here, keyed by the weight's data
 * pointer, until the cache is freed - as the CUDA backend keeps its device copies (a model's
 * tensors stay put while it is open). A lookup checks the size and the first and last bytes of
 * the source, so that a different tensor later allocated at the same address (tests) is
 * regrouped anew instead of served stale. Once a weight is regrouped, its source's pages are given
 * back to the model file (ts_mmap_release): they hold the same bytes and are read again from the
 * file where something still wants them. Used by one thread at a time (the backend's). */
#ifndef TS_BACKEND_CPU_WEIGHT_CACHE_H
#define TS_BACKEND_CPU_WEIGHT_CACHE_H

#include "base/threadpool.h"

#include <stddef.h>
#include <stdint.h>

/* Writes bytes bytes of a weight's rows (whole rows of row_bytes) from src in a kernel's layout at
 * dst (same size; dst may be src). */
typedef void (*cpu_repack_fn)(const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes);

typedef struct cpu_wcache cpu_wcache;

cpu_wcache *cpu_wcache_new(void);
void cpu_wcache_free(cpu_wcache *c);

/* The bytes of src (bytes long, whole rows of row_bytes) in repack's layout: the cached copy, made
 * now by the pool's threads if there is none. NULL when out of memory or past the limit below
 * (the caller then takes a kernel that reads the file's layout). */
const uint8_t *cpu_wcache_get(cpu_wcache *c, ts_pool *pool, const uint8_t *src, size_t bytes,
                              size_t row_bytes, cpu_repack_fn repack);

/* The most bytes the copies may hold (default: no limit); a weight that would pass it gets no
 * copy, and its product runs on a kernel that reads the file's layout. 0: no copies at all. */
void cpu_wcache_set_limit(cpu_wcache *c, size_t bytes);

/* For tests: the copies made so far, and the bytes they hold. */
long cpu_wcache_repacks(const cpu_wcache *c);
size_t cpu_wcache_bytes(const cpu_wcache *c);

/* src regrouped by repack into dst by the pool's threads (pool may be NULL), in slices of
 * whole rows of row_bytes. */
void cpu_repack_run(ts_pool *pool, const uint8_t *src, uint8_t *dst, size_t bytes, size_t row_bytes,
                    cpu_repack_fn repack);

#endif

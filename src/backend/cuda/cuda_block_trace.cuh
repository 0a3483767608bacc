/* Block traces (a developer's build: cmake -DTESSERA_CUDA_BLOCK_TRACE=ON): for every block of
 * every kernel, the device's global timer before and after its programmatic wait, where the
 * block ends and up to four points inside it, for bench/cuda_block_trace.py - where a step's
 * time goes between the kernels' early loads, their dependent round trips and their ends, which
 * a per-kernel trace (Nsight Systems) cannot show.
 *
 * A record is 8 words: [0] the timer before the wait, [1] after it, [2] multiprocessor << 48 |
 * grid blocks << 24 | block, [3] the block's end (cuda_trace_end, 0 where the kernel marks
 * none), [4..7] inner points (cuda_trace_at, 0 where none). Each translation unit keeps its own
 * buffer (no relocatable device code); the backend writes them all, unordered, to
 * $TESSERA_CUDA_BLOCK_TRACE_FILE when it is destroyed. A block takes its record's slot with an
 * atomic before the wait, where the round trip overlaps its predecessor; the recording still
 * adds some 30-50 us to a 0.8B step, so compare runs of one build. Without the option every
 * function here is empty. */
#pragma once

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef TESSERA_CUDA_BLOCK_TRACE
#define CUDA_TRACE_CAP (1u << 21) /* records a translation unit keeps */

static __device__ unsigned long long cuda_trace_buf[CUDA_TRACE_CAP * 8];
static __device__ unsigned cuda_trace_n;

__device__ static inline unsigned long long cuda_trace_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* the block's slot, for its end and inner points */
__device__ static inline unsigned *cuda_trace_slot(void) {
    __shared__ unsigned slot;
    return &slot;
}
__device__ static inline bool cuda_trace_lead(void) {
    return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

/* Defined in cuda_backend.cu: the writers of the translation units' buffers. */
void cuda_trace_register(void (*dump)(FILE *));

static void cuda_trace_dump(FILE *f) {
    unsigned n = 0;
    if (cudaMemcpyFromSymbol(&n, cuda_trace_n, sizeof n) != cudaSuccess) return;
    if (n > CUDA_TRACE_CAP) n = CUDA_TRACE_CAP;
    size_t bytes = (size_t)n * 64;
    void *h = malloc(bytes ? bytes : 1);
    if (h && cudaMemcpyFromSymbol(h, cuda_trace_buf, bytes) == cudaSuccess) fwrite(h, 64, n, f);
    free(h);
}
static struct cuda_trace_unit {
    cuda_trace_unit() { cuda_trace_register(cuda_trace_dump); }
} cuda_trace_unit_registered;
#endif

/* Before and after the programmatic wait (cuda_pdl_entry): t0 is the wait's start. */
__device__ static inline void cuda_trace_wait_start(unsigned long long *t0) {
#if defined(TESSERA_CUDA_BLOCK_TRACE) && defined(__CUDA_ARCH__)
    *t0 = cuda_trace_now();
    if (cuda_trace_lead()) *cuda_trace_slot() = atomicAdd(&cuda_trace_n, 1u);
#else
    (void)t0;
#endif
}
__device__ static inline void cuda_trace_wait_end(unsigned long long t0) {
#if defined(TESSERA_CUDA_BLOCK_TRACE) && defined(__CUDA_ARCH__)
    unsigned long long t1 = cuda_trace_now();
    unsigned i = *cuda_trace_slot();
    if (!cuda_trace_lead() || i >= CUDA_TRACE_CAP) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned long long g = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
    unsigned long long b =
        blockIdx.x +
        (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    unsigned long long *r = cuda_trace_buf + 8 * (size_t)i;
    r[0] = t0, r[1] = t1, r[2] = (unsigned long long)smid << 48 | g << 24 | b;
    for (int k = 3; k < 8; k++)
        r[k] = 0;
#else
    (void)t0;
#endif
}

/* Inner point k (4..7) of the block, as its first thread passes it. */
__device__ static inline void cuda_trace_at(int k) {
#if defined(TESSERA_CUDA_BLOCK_TRACE) && defined(__CUDA_ARCH__)
    unsigned i = *cuda_trace_slot();
    if (cuda_trace_lead() && i < CUDA_TRACE_CAP)
        cuda_trace_buf[8 * (size_t)i + k] = cuda_trace_now();
#else
    (void)k;
#endif
}

/* The block's end: every thread of the block calls it (a barrier). */
__device__ static inline void cuda_trace_end(void) {
#if defined(TESSERA_CUDA_BLOCK_TRACE) && defined(__CUDA_ARCH__)
    __syncthreads();
    unsigned i = *cuda_trace_slot();
    if (cuda_trace_lead() && i < CUDA_TRACE_CAP)
        cuda_trace_buf[8 * (size_t)i + 3] = cuda_trace_now();
#endif
}

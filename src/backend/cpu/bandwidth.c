/* Read-bandwidth probe: every pool thread sums its slice of one large buffer; the best pass
 * gives the sustainable read rate of the memory system for this thread count. */
#include "backend/cpu/bandwidth.h"

#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_int.h"
#include "base/clock.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define BW_SLICE_ALIGN 4096 /* slices start on page (and so cache-line) boundaries */

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    cpu_isa isa;
    uint64_t sums[1024]; /* one per thread (ts_pool caps threads at 1024) */
} bw_task;

static uint64_t read_sum_scalar(const void *p, size_t bytes) {
    const uint64_t *v = p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < bytes / 8; i += 4) {
        a0 += v[i];
        a1 += v[i + 1];
        a2 += v[i + 2];
        a3 += v[i + 3];
    }
    return a0 + a1 + a2 + a3;
}

static void bw_worker(void *ctx, int ith, int nth) {
    bw_task *task = ctx;
    long pages = (long)(task->bytes / BW_SLICE_ALIGN), lo, hi;
    ts_split_range(pages, ith, nth, &lo, &hi);
    const uint8_t *p = task->buf + (size_t)lo * BW_SLICE_ALIGN;
    size_t n = (size_t)(hi - lo) * BW_SLICE_ALIGN;
    uint64_t s;
    switch (task->isa) {
    case CPU_ISA_AVX512: s = cpu_read_sum_avx512(p, n); break;
    case CPU_ISA_AVX2: s = cpu_read_sum_avx2(p, n); break;
    default: s = read_sum_scalar(p, n); break;
    }
    task->sums[ith] = s;
}

double cpu_measure_read_bandwidth(ts_pool *pool, size_t bytes, int reps) {
    bytes -= bytes % BW_SLICE_ALIGN;
    if (bytes == 0) return 0.0;
    /* mmap rather than malloc: page aligned, and huge pages (where allowed) keep TLB misses
     * out of the figure, as they are for the mmap'd weights of a large model */
    void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 0.0;
#ifdef MADV_HUGEPAGE
    madvise(buf, bytes, MADV_HUGEPAGE);
#endif
    memset(buf, 1, bytes); /* fault every page in before timing */
    bw_task task = {.buf = buf, .bytes = bytes, .isa = cpu_isa_best()};
    double best = 0.0;
    uint64_t check = 0;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
        double t0 = ts_now_s();
        ts_pool_run(pool, bw_worker, &task);
        double dt = ts_now_s() - t0;
        for (int i = 0; i < ts_pool_size(pool); i++) check += task.sums[i];
        double gbs = (double)bytes / dt * 1e-9;
        if (gbs > best) best = gbs;
    }
    munmap(buf, bytes);
    /* every byte is 1, so the sums are known; a mismatch means the loads did not all happen */
    return check == (uint64_t)(reps > 0 ? reps : 1) * (bytes / 8) * 0x0101010101010101ull
               ? best
               : 0.0;
}

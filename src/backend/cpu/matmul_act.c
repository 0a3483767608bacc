/* Prefill's activations quantized once per matmul (cpu_matmul_n, matmul_q.h).
 *
 * A quantized kernel quantizes the tokens it multiplies (cpu_q8act_quantize); left to the
 * kernels, every thread quantizes every token, once per weight of a stack (the delta rule's
 * four input projections, a gated MLP's two): 2-4 times the work, 4-6% of a prefill. Here the
 * threads split the tokens once, into a buffer every kernel of the call reads (cpu_mm_job.xq).
 * The buffer belongs to the calling thread (one matmul at a time per thread: the pool is not
 * reentrant) and grows to the largest call, up to ACT_MAX_BYTES; nothing is allocated once it
 * has. */
#include "backend/cpu/matmul_q.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    const float *x;
    int64_t ldx, cols;
    int n_tok, layout;
    void (*quantize)(const float *x, int64_t n, void *buf);
    uint8_t *xq;
} act_task;

static void act_worker(void *p, int ith, int nth) {
    const act_task *a = p;
    const size_t ab = cpu_q8act_bytes(a->cols);
    long lo, hi;
    ts_split_range(a->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        uint8_t *buf = a->xq + (size_t)t * ab;
        a->quantize(a->x + t * a->ldx, a->cols, buf);
        cpu_q8act_arrange(a->layout, a->cols, buf);
    }
}

/* the calling thread's buffer, freed when the thread ends */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

typedef struct {
    uint8_t *p;
    size_t size;
} act_scratch;

static void scratch_free(void *p) {
    act_scratch *s = p;
    free(s->p);
    free(s);
}

static void scratch_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

static uint8_t *scratch_get(size_t size) {
    pthread_once(&scratch_once, scratch_init);
    act_scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->size < size) {
        size_t want = (size + 63) / 64 * 64;
        uint8_t *p = aligned_alloc(64, want);
        if (!p) return NULL;
        free(s->p);
        s->p = p, s->size = want;
    }
    return s->p;
}

/* Beyond this the kernels quantize for themselves, tile by tile, rather than the buffer holding
 * a whole call's tokens (the 0.8B's widest prefill of 512 tokens takes 2.7 MB). */
#define ACT_MAX_BYTES ((size_t)64 << 20)

const uint8_t *cpu_mm_act_prepare(ts_pool *pool, const cpu_mm_kernel *k, int layout, const float *x,
                                  int64_t ldx, int64_t cols, int n_tok) {
    act_task a = {x, ldx, cols, n_tok, layout, k->act_quantize, NULL};
    const size_t bytes = (size_t)n_tok * cpu_q8act_bytes(cols);
    if (bytes > ACT_MAX_BYTES) return NULL;
    a.xq = scratch_get(bytes);
    if (!a.xq) return NULL; /* the kernels quantize for themselves */
    ts_pool_run(pool, act_worker, &a);
    return a.xq;
}

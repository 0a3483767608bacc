/* A LoRA pair's product added to a matmul's output (backend.h, lora_add): y += s * B (A x).
 *
 * As matmul, scale_rows and matmul again it took four jobs of the thread pool a pair (the
 * second matmul into a scratch, then an add), each a wake-up of the threads for a few
 * microseconds of work: a decode step of Gemma 3 270M with an adapter on its 126 weights spent
 * more time so than in the pairs' arithmetic. Here it is two jobs: the thin products u = s * A x
 * (one dot product of `in` values a token and rank, shared out), then each thread's rows of
 * y += B u. The dot products keep 8 partial sums, which the compiler maps to vector lanes. For
 * a few tokens only: a prefill's many go to the matmul kernels, which are faster there (pp512 of
 * Gemma 3 270M with an adapter on every weight: ~670 t/s this way, ~900 through the matmuls). */
#include "backend/cpu/cpu_int.h"
#include "base/threadpool.h"

#define CPU_LORA_MAX_TOK 16

typedef struct {
    const float *A, *B, *x, *s;
    int64_t ldx, ldy;
    int n, in, out, r;
    float *y, *u;
} lora_job;

static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += a[i + k] * b[i + k];
    float s = 0;
    for (; i < n; i++)
        s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void thin(void *ctx, int ith, int nth) { /* u[t, k] = s[t] * A[k, :] . x[t, :] */
    lora_job *j = ctx;
    long lo, hi;
    ts_split_range((long)j->n * j->r, ith, nth, &lo, &hi);
    for (long p = lo; p < hi; p++) {
        int t = (int)(p / j->r), k = (int)(p % j->r);
        j->u[p] = j->s[t] * dot(j->A + (int64_t)k * j->in, j->x + t * j->ldx, j->in);
    }
}

static void widen(void *ctx, int ith, int nth) { /* y[t, o] += B[o, :] . u[t, :] */
    lora_job *j = ctx;
    long lo, hi;
    ts_split_range(j->out, ith, nth, &lo, &hi);
    for (int t = 0; t < j->n; t++)
        for (long o = lo; o < hi; o++)
            j->y[t * j->ldy + o] += dot(j->B + o * j->r, j->u + (int64_t)t * j->r, j->r);
}

bool cpu_op_lora_add(ts_backend *be, const ts_tensor *A, const ts_tensor *B, const float *x,
                     int64_t ldx, int n, const float *s, float *y, int64_t ldy, float *u) {
    if (n > CPU_LORA_MAX_TOK || A->dtype != TS_DTYPE_F32 || B->dtype != TS_DTYPE_F32) return false;
    lora_job j = {A->data,
                  B->data,
                  x,
                  s,
                  ldx,
                  ldy,
                  n,
                  (int)ts_tensor_cols(A),
                  (int)ts_tensor_rows(B),
                  (int)ts_tensor_rows(A),
                  y,
                  u};
    ts_pool *pool = cpu_of(be)->pool;
    ts_pool_run(pool, thin, &j);
    ts_pool_run(pool, widen, &j);
    return true;
}
